"""The API client: the only operator modules that call the Kubernetes API, log in, and post Events."""
