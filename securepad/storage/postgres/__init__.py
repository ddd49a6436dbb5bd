"""The PostgreSQL backend: database, pipeline, prepared statements, migrations, roles."""
