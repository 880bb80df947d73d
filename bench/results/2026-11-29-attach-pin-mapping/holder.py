import ctypes, mmap, os, sys, time
path, kind = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(path, os.O_RDONLY)
n = os.fstat(fd).st_size
flags = mmap.MAP_SHARED if kind == "shared" else mmap.MAP_PRIVATE
a = libc.mmap(None, n, mmap.PROT_READ, flags, fd, 0)
assert a != ctypes.c_void_p(-1).value
assert libc.mlock(ctypes.c_void_p(a), ctypes.c_size_t(n)) == 0, ctypes.get_errno()
print("held", flush=True)
time.sleep(3600)
