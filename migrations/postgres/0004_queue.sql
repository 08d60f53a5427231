-- Several servers on one database. A deployment is recorded `queued` and
-- claimed by a server with room that has loaded its deployer at
-- `plugin_sha256`; the claiming server owns it (`server_id`) and renews
-- `lease_until` (Unix milliseconds) while it runs. `cancel` holds the
-- reason once a cancel was asked, on whichever server. `servers` says who
-- is alive and what each can run, so a deployment nobody can run fails.
ALTER TABLE deployments DROP CONSTRAINT deployments_status_check;
ALTER TABLE deployments ADD CONSTRAINT deployments_status_check
    CHECK (status IN ('queued', 'running', 'completed', 'failed'));
ALTER TABLE deployments ADD COLUMN plugin_sha256 TEXT;
ALTER TABLE deployments ADD COLUMN lease_until BIGINT;
ALTER TABLE deployments ADD COLUMN cancel TEXT;
ALTER TABLE deployments ADD COLUMN started_at TEXT;
UPDATE deployments SET started_at = created_at;
CREATE INDEX deployments_queued ON deployments (status, id);

CREATE TABLE servers (
    id        TEXT   PRIMARY KEY,
    name      TEXT   NOT NULL,
    seen_ms   BIGINT NOT NULL,
    -- A JSON array of "deployer@sha256" this server can run.
    deployers TEXT   NOT NULL DEFAULT '[]'
);
