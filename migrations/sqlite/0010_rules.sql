-- Deploy rules (see ../postgres/0010_rules.sql).
CREATE TABLE rules (
    name       TEXT    PRIMARY KEY,
    body       TEXT    NOT NULL,
    created_by TEXT,
    created_at TEXT    NOT NULL,
    updated_at TEXT    NOT NULL
);

CREATE TABLE rule_firings (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    rule          TEXT    NOT NULL,
    event_id      BIGINT  NOT NULL,
    model_id      BIGINT  NOT NULL,
    deployment_id BIGINT,
    error         TEXT,
    server_id     TEXT    NOT NULL,
    created_at    TEXT    NOT NULL,
    UNIQUE (rule, event_id)
);
CREATE INDEX rule_firings_by_rule ON rule_firings (rule, id);

CREATE TABLE rule_cursor (
    one        INTEGER PRIMARY KEY CHECK (one = 1),
    handled_id BIGINT  NOT NULL
);
-- From the end of the log: events before rules existed fire none.
INSERT INTO rule_cursor (one, handled_id) SELECT 1, COALESCE(MAX(id), 0) FROM events;
