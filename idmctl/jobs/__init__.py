"""Jobs: render the batch script, submit it, sync scheduler records, retry by cause."""
