-- Where a deployer's version was pulled from: the registry's manifest,
-- pinned by its digest (oci://REGISTRY/REPOSITORY@sha256:…); null for a
-- version uploaded over the API.
ALTER TABLE deployer_versions ADD COLUMN source TEXT;
