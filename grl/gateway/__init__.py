"""An OpenAI-compatible endpoint in front of GRL's rollout engine (`grl serve`), which records the token ids
the engine sampled for each episode of an agent program, so that training uses exactly those ids."""

from grl.gateway.app import build_app
from grl.gateway.batching import SerialEngine
from grl.gateway.episodes import Call, EpisodeLog
from grl.gateway.server import BadRequest, Gateway, tool_calls_of

__all__ = ["BadRequest", "Call", "EpisodeLog", "Gateway", "SerialEngine", "build_app", "tool_calls_of"]
