"""Process plumbing: one-line errors (`cli`), JAX's distributed runtime (`hosts`), allocator
settings (`memory`), progress bars (`progress`), the environment record (`environment`) and
compile counting (`compiles`)."""
