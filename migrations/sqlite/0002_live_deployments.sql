-- Live operations: where a running deployment stands, and what its deployer
-- said. `progress` is a JSON object (bytes/files fetched, the deployer's own
-- progress); `logs` holds the guest's log lines, bounded, written at the end.
ALTER TABLE deployments ADD COLUMN phase TEXT;
ALTER TABLE deployments ADD COLUMN progress TEXT NOT NULL DEFAULT '{}';
ALTER TABLE deployments ADD COLUMN logs TEXT NOT NULL DEFAULT '';
