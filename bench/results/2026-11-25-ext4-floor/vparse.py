import json,sys
d=json.load(sys.stdin)
print("total %.2f s write %.2f s read %.2f s" % (d["total_secs"], d["write_secs"], d["read_secs"]))
