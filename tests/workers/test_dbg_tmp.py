import sys; sys.path.insert(0, '/work/main/tests/workers')
from test_groups import *
from test_groups import _fresh_optimizer, _full_weights

def test_dbg(actor, batch):
    actor.execute(_fresh_optimizer)
    before = actor.execute(_full_weights)[0]
    metrics = actor.update(batch)
    after = actor.execute(_full_weights)[0]
    want, pg_loss, grad_norm = reference_ppo_step(before, batch)
    print(metrics, pg_loss, grad_norm)
    for k in after:
        d = (after[k]-want[k]).abs()
        print(k, float(d.max()), float((after[k]-before[k]).abs().max()), float((want[k]-before[k]).abs().max()))
    assert 0
