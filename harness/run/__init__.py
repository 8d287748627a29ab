"""The measured run: the supervisor that sets the limits and starts the worker, the worker that
decodes with a mechanism behind the routing hook, the mechanisms, and where each token's time
goes."""
