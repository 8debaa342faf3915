"""The instant attention view (one HTML page with its data) and its notebook widget."""
