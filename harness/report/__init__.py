"""The report: RESULTS.md with its tables, figures and captions, the numbers' citations,
machines side by side, exports in llama-bench's formats, and the committed reference runs."""
