"""Tools that code in a kernel calls: the registry (specs from plugins) and MCP servers as tools."""
