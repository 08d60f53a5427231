-- Deployments asked for by rules (see ../postgres/0009_approvals.sql): a
-- new status, `awaiting_approval`, before `queued`; the rule and the event
-- (or previous deployment) that caused one; an admin's decision, as JSON
-- ({decision, by, at, comment}). SQLite cannot change a CHECK, so the
-- deployments table is rebuilt with the new status allowed.
CREATE TABLE deployments_next (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    model_id      INTEGER NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    deployer      TEXT    NOT NULL,
    options       TEXT    NOT NULL DEFAULT '{}',
    status        TEXT    NOT NULL CHECK (status IN ('awaiting_approval', 'queued', 'running', 'completed', 'failed')),
    dir           TEXT    NOT NULL,
    out_dir       TEXT    NOT NULL,
    ref           TEXT,
    details       TEXT    NOT NULL DEFAULT '{}',
    error         TEXT,
    duration_ms   BIGINT,
    server_id     TEXT    NOT NULL,
    created_at    TEXT    NOT NULL,
    completed_at  TEXT,
    phase         TEXT,
    progress      TEXT    NOT NULL DEFAULT '{}',
    logs          TEXT    NOT NULL DEFAULT '',
    created_by    TEXT,
    plugin_sha256 TEXT,
    lease_until   BIGINT,
    cancel        TEXT,
    started_at    TEXT,
    published     TEXT    NOT NULL DEFAULT '[]',
    cause_rule    TEXT,
    cause_event   BIGINT,
    cause_previous BIGINT,
    approval      TEXT
);
INSERT INTO deployments_next (id, model_id, deployer, options, status, dir, out_dir, ref,
    details, error, duration_ms, server_id, created_at, completed_at, phase, progress, logs,
    created_by, plugin_sha256, lease_until, cancel, started_at, published)
SELECT id, model_id, deployer, options, status, dir, out_dir, ref, details, error,
    duration_ms, server_id, created_at, completed_at, phase, progress, logs, created_by,
    plugin_sha256, lease_until, cancel, started_at, published
FROM deployments;
DROP TABLE deployments;
ALTER TABLE deployments_next RENAME TO deployments;
CREATE INDEX deployments_by_model ON deployments (model_id, id);
CREATE INDEX deployments_running ON deployments (server_id, status);
CREATE INDEX deployments_queued ON deployments (status, id);

-- A version of a stored deployer whose manifest grants more than the
-- version it would replace is stored but held: `held` lists what it adds
-- (a JSON array of sentences) until an admin approves it; null otherwise.
ALTER TABLE deployer_versions ADD COLUMN held TEXT;
