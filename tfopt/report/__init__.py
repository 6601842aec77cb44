"""Report: the run summary, its diagnosis of slow variants, tables and figures."""
