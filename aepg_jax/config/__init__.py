"""The run configuration: `schema` (every field, its default, `validate`), `validation` (the
rules behind `validate`), `arguments` (config-file arguments and the paper configs' shared
settings), `input_files` (cheap checks of the weights and split files a config names)."""
