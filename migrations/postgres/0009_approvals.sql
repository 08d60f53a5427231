-- Deployments asked for by rules: a new status, `awaiting_approval`,
-- before `queued` (nothing claims it until an admin approves it); the
-- rule and the stored event (and, for a chain, the previous deployment)
-- that caused one; an admin's decision, as JSON ({decision, by, at,
-- comment}).
ALTER TABLE deployments DROP CONSTRAINT deployments_status_check;
ALTER TABLE deployments ADD CONSTRAINT deployments_status_check
    CHECK (status IN ('awaiting_approval', 'queued', 'running', 'completed', 'failed'));
ALTER TABLE deployments ADD COLUMN cause_rule TEXT;
ALTER TABLE deployments ADD COLUMN cause_event BIGINT;
ALTER TABLE deployments ADD COLUMN cause_previous BIGINT;
ALTER TABLE deployments ADD COLUMN approval TEXT;

-- A version of a stored deployer whose manifest grants more than the
-- version it would replace is stored but held: `held` lists what it adds
-- (a JSON array of sentences) until an admin approves it; null otherwise.
ALTER TABLE deployer_versions ADD COLUMN held TEXT;
