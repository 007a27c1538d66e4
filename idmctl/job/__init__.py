"""The job as it will run: the effective job (spec + profile + flags), its code snapshot, its batch script."""
