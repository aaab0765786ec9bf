"""Training kit that runs inside tasks. Imports nothing else of trainyard."""
