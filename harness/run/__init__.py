"""The measured run: the supervisor that sets the limits and starts the worker, the worker that
decodes with a mechanism behind the routing hook, and the mechanisms."""
