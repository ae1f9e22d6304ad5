"""OpenTelemetry spans for turns, model calls and cells, live (spans) and replayed from history (replay)."""
