-- A model's OMS signature (model.sig), as given with its registration, and
-- what verifying it said: who signed it and when, or why it does not vouch
-- for the model's files. All NULL for a model registered without one.
ALTER TABLE models ADD COLUMN signature TEXT;
ALTER TABLE models ADD COLUMN signature_method TEXT;
ALTER TABLE models ADD COLUMN signature_signer TEXT;
ALTER TABLE models ADD COLUMN signature_verified_at TEXT;
ALTER TABLE models ADD COLUMN signature_error TEXT;
