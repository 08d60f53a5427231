-- berth's records (SQLite). Keep in step with ../postgres/0001_initial.sql:
-- same tables, same columns, same meaning. Timestamps are RFC 3339 UTC text.
CREATE TABLE models (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    name            TEXT    NOT NULL,
    job_id          TEXT    NOT NULL UNIQUE,
    base_model      TEXT    NOT NULL,
    model_size      TEXT    NOT NULL,
    dataset         TEXT    NOT NULL,
    num_examples    BIGINT  NOT NULL,
    num_train_steps BIGINT  NOT NULL,
    final_loss      DOUBLE PRECISION,
    params          TEXT    NOT NULL DEFAULT '{}',
    source          TEXT    NOT NULL,
    created_at      TEXT    NOT NULL
);

CREATE TABLE model_files (
    model_id   INTEGER NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    position   BIGINT  NOT NULL,
    path       TEXT    NOT NULL,
    size_bytes BIGINT  NOT NULL,
    sha256     TEXT,
    PRIMARY KEY (model_id, path)
);

CREATE TABLE deployments (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    model_id     INTEGER NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    deployer     TEXT    NOT NULL,
    options      TEXT    NOT NULL DEFAULT '{}',
    status       TEXT    NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
    dir          TEXT    NOT NULL,
    out_dir      TEXT    NOT NULL,
    ref          TEXT,
    details      TEXT    NOT NULL DEFAULT '{}',
    error        TEXT,
    duration_ms  BIGINT,
    -- Which server process runs it: at start a server fails only its own
    -- leftovers, never a running deployment of another replica.
    server_id    TEXT    NOT NULL,
    created_at   TEXT    NOT NULL,
    completed_at TEXT
);

CREATE INDEX deployments_by_model ON deployments (model_id, id);
CREATE INDEX deployments_running ON deployments (server_id, status);
