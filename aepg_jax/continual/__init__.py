"""Class-incremental continual learning: task loop, metrics and reports."""
