"""Process plumbing: one-line errors (`cli`), JAX's distributed runtime (`hosts`), allocator
settings (`memory`), the host memory left to the process (`host_memory`), progress bars
(`progress`), the environment record (`environment`) and compile counting (`compiles`)."""
