-- Training values nobody gave are NULL, not 0 or '': a model card said
-- "Examples: 0, Steps: 0" for a run that never said. 0 and '' were what
-- "not given" was stored as until now.
ALTER TABLE models
    ALTER COLUMN base_model DROP NOT NULL,
    ALTER COLUMN model_size DROP NOT NULL,
    ALTER COLUMN dataset DROP NOT NULL,
    ALTER COLUMN num_examples DROP NOT NULL,
    ALTER COLUMN num_train_steps DROP NOT NULL;
UPDATE models SET
    base_model = NULLIF(base_model, ''),
    model_size = NULLIF(model_size, ''),
    dataset = NULLIF(dataset, ''),
    num_examples = NULLIF(num_examples, 0),
    num_train_steps = NULLIF(num_train_steps, 0);
