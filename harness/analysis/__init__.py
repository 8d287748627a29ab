"""Analysis: the runs table from the run records, the statistics of a comparison, and the
findings, each judging one claim of the study with its tables and figures."""
