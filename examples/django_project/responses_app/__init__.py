"""The Responses API views of the example project."""
