"""Django's PostgreSQL backend with a connection-pool check that costs no query."""
