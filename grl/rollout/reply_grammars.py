"""The valid-action grammar of each agent's next reply (grl/rollout/multi_turn.py), compiled once per set of
actions and kept; an env that cannot list its actions ends its episode as a failure."""

from __future__ import annotations

import logging
import traceback

from grl.engines.constraint import GrammarError, ReplyGrammar, compile_reply_grammar
from grl.envs.base import fault_kind
from grl.envs.checks import EnvValueError
from grl.rollout.chat import ChatTokens
from grl.rollout.env_faults import EnvFaults
from grl.rollout.slot import Slot

log = logging.getLogger("grl.rollout")

MAX_GRAMMARS = 4096  # action lists that change every turn (TextWorld) stay bounded


class ReplyGrammars:
    def __init__(self, chat: ChatTokens, faults: EnvFaults):
        self.chat = chat
        self.faults = faults
        self._end_ids = chat.end_ids()
        self._grammars: dict[tuple, ReplyGrammar] = {}
        self._warned_left_out: set[str] = set()

    def of(self, s: Slot, limit: int) -> ReplyGrammar | None:
        """The grammar of the slot's next reply (None: free decoding); an env that cannot list its
        actions, or whose actions do not fit in `limit` tokens, ends the episode as a failure."""
        try:
            choices = s.agent.answer_choices()
            if choices is None:
                return None
            key = (tuple(choices), s.agent.settings.enable_think, limit)
            if key not in self._grammars:
                if len(self._grammars) >= MAX_GRAMMARS:
                    self._grammars.clear()
                self._grammars[key] = self._compile(s, choices, limit)
            return self._grammars[key]
        except EnvValueError as err:
            self.faults.fail(s, str(err), False, "valid_actions", err.kind)
        except GrammarError as err:
            self.faults.fail(s, f"{s.task.name}: constrained decoding: {err}", False, "valid_actions")
        except Exception as err:  # noqa: BLE001 - a broken env ends this episode, never the rollout
            self.faults.fail(s, traceback.format_exc(), False, "valid_actions", fault_kind(err))
        return None

    def _compile(self, s: Slot, choices: list[str], limit: int) -> ReplyGrammar:
        grammar = compile_reply_grammar(
            self.chat.encode, self._end_ids, choices, s.agent.settings.enable_think, limit
        )
        if grammar.left_out and s.task.name not in self._warned_left_out:
            self._warned_left_out.add(s.task.name)
            log.warning(
                "%s: valid actions that do not fit in %d reply tokens cannot be chosen, e.g. %r; "
                "raise agent_config.max_tokens (and max_response_length)",
                s.task.name,
                limit,
                grammar.left_out[0],
            )
        return grammar
