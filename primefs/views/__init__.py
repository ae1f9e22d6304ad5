"""Presentation shared by the command line and the web view: history events as people read them,
the session tree as a table, times as people write and read them."""
