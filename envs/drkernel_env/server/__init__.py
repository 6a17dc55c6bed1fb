"""The server side of the environment: `server.app:app`, as the manifest names it."""
