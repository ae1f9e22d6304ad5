"""The index (`.primefs/index.sqlite`): a cache of what the session files say, for questions across
sessions (names, trees, events, usage), and the archive of finished trees it also covers."""
