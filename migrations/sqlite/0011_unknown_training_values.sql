-- Training values nobody gave are NULL, not 0 or '' (see
-- ../postgres/0011_unknown_training_values.sql). SQLite cannot drop a
-- NOT NULL, and rebuilding `models` would cascade into its children, so
-- each column is replaced in place: a nullable twin filled, the old one
-- dropped, the twin renamed. 0 and '' were what "not given" was stored as.
ALTER TABLE models ADD COLUMN base_model_next TEXT;
ALTER TABLE models ADD COLUMN model_size_next TEXT;
ALTER TABLE models ADD COLUMN dataset_next TEXT;
ALTER TABLE models ADD COLUMN num_examples_next BIGINT;
ALTER TABLE models ADD COLUMN num_train_steps_next BIGINT;
UPDATE models SET
    base_model_next = NULLIF(base_model, ''),
    model_size_next = NULLIF(model_size, ''),
    dataset_next = NULLIF(dataset, ''),
    num_examples_next = NULLIF(num_examples, 0),
    num_train_steps_next = NULLIF(num_train_steps, 0);
ALTER TABLE models DROP COLUMN base_model;
ALTER TABLE models DROP COLUMN model_size;
ALTER TABLE models DROP COLUMN dataset;
ALTER TABLE models DROP COLUMN num_examples;
ALTER TABLE models DROP COLUMN num_train_steps;
ALTER TABLE models RENAME COLUMN base_model_next TO base_model;
ALTER TABLE models RENAME COLUMN model_size_next TO model_size;
ALTER TABLE models RENAME COLUMN dataset_next TO dataset;
ALTER TABLE models RENAME COLUMN num_examples_next TO num_examples;
ALTER TABLE models RENAME COLUMN num_train_steps_next TO num_train_steps;
