"""What the routes and the worker do, apart from HTTP: resolving inputs, creating and reading jobs."""
