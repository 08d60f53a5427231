-- Deployers added at run time over the API (see ../postgres/0006_catalog.sql).
CREATE TABLE plugin_blobs (
    sha256 TEXT    PRIMARY KEY,
    wasm   BLOB    NOT NULL,
    size   INTEGER NOT NULL
);

CREATE TABLE deployer_versions (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    name      TEXT    NOT NULL,
    sha256    TEXT    NOT NULL REFERENCES plugin_blobs (sha256),
    manifest  TEXT,
    signature TEXT,
    added_by  TEXT,
    added_at  TEXT    NOT NULL
);
CREATE INDEX deployer_versions_by_name ON deployer_versions (name, id);

CREATE TABLE stored_deployers (
    name       TEXT    PRIMARY KEY,
    version_id INTEGER NOT NULL REFERENCES deployer_versions (id)
);
