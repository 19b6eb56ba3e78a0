"""`grl-train` as the console script runs it (grl.train.main, the same arguments), with GRL's own INFO lines
shown: where the groups' ranks went, which rank holds the engine, the checkpoint a run resumed from. The
driver configures no logging of its own, so these lines would otherwise go nowhere; the kit's report
quotes them.

    python scripts/gpu_kit/driver.py KEY=VALUE ...
"""

import logging
import sys

handler = logging.StreamHandler()
handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
grl_log = logging.getLogger("grl")
grl_log.setLevel(logging.INFO)
grl_log.addHandler(handler)

from grl.train import main  # noqa: E402 - the handler first, so that import-time lines are kept too

sys.exit(main())
