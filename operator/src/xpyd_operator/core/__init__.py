"""The operator's pure core, no I/O: settings (`config`), planning (`scaling` -> `actions`), rendering
(`render`) and status (`status`)."""
