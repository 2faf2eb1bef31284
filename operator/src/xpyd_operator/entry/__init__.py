"""The operator's entry points: the Kopf handlers (`handlers`) and the process that runs them (`main`)."""
