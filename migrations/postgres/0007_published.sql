-- What a deployment put into publishing targets: a JSON array of receipts
-- ({target, key, url, bytes, sha256, etag}), in the order of the puts,
-- written with the deployment's progress while it runs and at its end, so
-- a deployment that failed halfway still lists what it did put.
ALTER TABLE deployments ADD COLUMN published TEXT NOT NULL DEFAULT '[]';
