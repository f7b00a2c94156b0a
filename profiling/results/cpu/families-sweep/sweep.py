import warnings, sys, time, torch, transformers
warnings.filterwarnings("ignore")
from transformers.utils import logging; logging.set_verbosity_error()
import rome
from rome.integrations import patch
from rome.integrations import transformers as rt
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, vocab_size=64, max_position_embeddings=64, pad_token_id=0)
calls = [0]
orig = rt.apply_qk
def counting(*a, **k):
    calls[0] += 1; return orig(*a, **k)
rt.apply_qk = counting
kinds = sys.argv[1:]
import signal
def _alarm(*a): raise TimeoutError('60s')
signal.signal(signal.SIGALRM, _alarm)
for kind in kinds:
    signal.alarm(60)
    print('#', kind, flush=True)
    t = time.time()
    try:
        cfg = transformers.AutoConfig.for_model(kind, **TINY); cfg._attn_implementation = "eager"
        torch.manual_seed(0)
        m = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    except Exception as e:
        print(kind, "BUILD", type(e).__name__, str(e)[:100]); continue
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    try:
        with torch.no_grad(): want = m(ids).logits
    except Exception as e:
        print(kind, "UNPATCHED-RUN", type(e).__name__); continue
    try:
        h = patch(m, backend="torch")
    except Exception as e:
        print(kind, "PATCH", type(e).__name__, str(e)[:200]); continue
    c0 = calls[0]
    try:
        with torch.no_grad(): got = m(ids).logits
    except Exception as e:
        h.undo(); print(kind, "RUN", type(e).__name__, str(e)[:150]); continue
    n = calls[0] - c0
    h.undo()
    with torch.no_grad(): back = m(ids).logits
    print(kind, "ok" if (got-want).abs().max() < 1e-5 and torch.equal(back, want) else "MISMATCH",
          f"{(got-want).abs().max().item():.2e}", "rome calls", n, f"{time.time()-t:.1f}s")
