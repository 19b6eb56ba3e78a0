"""OpenEnv (openenv-core): GRL playing OpenEnv environments through their client (env.py), with typed actions
(actions.py), MCP tools (mcp.py), env packages (packages.py) and the local servers it starts (servers.py);
and GRL's own envs served to OpenEnv clients (serve.py, serve_typed.py). Nothing here is imported by
`import grl.envs`: the registry names `grl.envs.openenv.env:OpenEnvEnv`, loaded when a task asks for it."""
