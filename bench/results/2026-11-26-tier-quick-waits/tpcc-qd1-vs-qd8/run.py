import sys, os, json
sys.path.insert(0, '/work/main/bench/suite')
import tier, lib
class WS: disk='/var/tmp'; dhrd='/work/main/target/release/dhrd'; dhrd_bench='/work/main/target/release/dhrd-bench'
class Ctx:
    ws=WS(); out='/tmp/qd1'; traces='/work/shared/traces'; p={}
    def pick(self, n): return n
ctx=Ctx()
data='/var/tmp/qd1-lower'; ssd='/var/tmp/qd1-ssd'; warm='/var/tmp/qd1-warm.spc'
lib.fill_file(data, 1<<30)
trace=os.path.join(ctx.traces, tier.TRACES['tpcc'])
reqs=tier.plan(ctx, trace, data, 3000)
chosen, written, planned = tier.placement(reqs, 0.8)
slots=len(set(chosen)|written); ssd_bytes=tier.tier_bytes_for(slots); mem=slots*tier.CHUNK
tier.warm_trace(warm, chosen)
for qd in (1, 8):
    for config in ('dhrd-tier', 'ssd-tier'):
        s=tier.start(ctx, config, data, ssd, ssd_bytes, mem)
        try:
            tier.replay(ctx, s.sock, warm, 8, None, '/tmp/qd1/warm.json')
            j=tier.replay(ctx, s.sock, trace, qd, 3000, f'/tmp/qd1/{config}-{qd}.json')
        finally:
            s.stop()
        print(qd, config, round(j['iops']), 'write p50', j['latency_us']['write']['p50'], 'read p50', j['latency_us']['read']['p50'], flush=True)
for f in (data, ssd, warm): os.unlink(f)
