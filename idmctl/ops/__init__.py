"""Running jobs: submit, sync scheduler records, retry by cause, executors, failure postmortems, the
ledger and the doctor."""
