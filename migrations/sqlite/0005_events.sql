-- The event log and webhook delivery (see ../postgres/0005_events.sql).
-- AUTOINCREMENT: an id is never handed out twice, even once every row
-- was pruned.
CREATE TABLE events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    kind       TEXT    NOT NULL,
    data       TEXT    NOT NULL,
    server_id  TEXT    NOT NULL,
    created_at TEXT    NOT NULL
);
CREATE INDEX events_by_time ON events (created_at);

CREATE TABLE event_log (
    one            INTEGER PRIMARY KEY CHECK (one = 1),
    pruned_through BIGINT  NOT NULL
);
INSERT INTO event_log (one, pruned_through) VALUES (1, 0);

CREATE TABLE webhook_state (
    key           TEXT    PRIMARY KEY,
    url           TEXT    NOT NULL,
    delivered_id  BIGINT  NOT NULL,
    given_up      BIGINT  NOT NULL DEFAULT 0,
    holder        TEXT,
    lease_until   BIGINT  NOT NULL DEFAULT 0,
    failing_id    BIGINT,
    failing_since TEXT,
    last_error    TEXT,
    next_attempt  TEXT
);
