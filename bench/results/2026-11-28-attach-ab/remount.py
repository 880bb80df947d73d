import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def sc(*a):
    r = libc.syscall(*a)
    if r < 0:
        e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
    return r
fd = sc(433, -100, sys.argv[1].encode(), 1)  # fspick(AT_FDCWD, path, FSPICK_CLOEXEC)
for flag in sys.argv[2:]:
    sc(431, fd, 0, flag.encode(), None, 0)  # FSCONFIG_SET_FLAG
sc(431, fd, 7, None, None, 0)  # FSCONFIG_CMD_RECONFIGURE
print("ok")
