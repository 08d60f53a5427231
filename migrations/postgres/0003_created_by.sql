-- Who registered a model and who asked for a deployment: the name of the
-- API token the request carried (NULL when the server runs without tokens).
ALTER TABLE models ADD COLUMN created_by TEXT;
ALTER TABLE deployments ADD COLUMN created_by TEXT;
