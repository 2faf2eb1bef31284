"""Pure planning: from the observed instances and the spec to the next actions, with no I/O."""
