"""Map output: neutral values (values), then one renderer per format (text, json, perfetto)."""
