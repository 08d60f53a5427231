-- What each file's bytes are (safetensors, pickle, zip-pickle, gguf, json,
-- other), sniffed by the first fetch that verified them: NULL until then,
-- since registration reads no byte.
ALTER TABLE model_files ADD COLUMN format TEXT;
