#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static long meminfo(const char *k) { FILE *f = fopen("/proc/meminfo","r"); char l[256]; long v=-1; while (fgets(l,sizeof l,f)) if (!strncmp(l,k,strlen(k))) { v = atol(l+strlen(k)+1); break;} fclose(f); return v; }
static long slab(const char *name) { FILE *f = fopen("/proc/slabinfo","r"); char l[512]; long v=-1; while (fgets(l,sizeof l,f)) { char n[64]; long act, num, sz; if (sscanf(l,"%63s %ld %ld %ld",n,&act,&num,&sz)==4 && !strcmp(n,name)) {v = num*sz; break;} } fclose(f); return v; }
int main(int argc, char **argv) {
  int n = atoi(argv[2]); long sz = atol(argv[3]);
  long pt0 = meminfo("PageTables:"), sl0 = meminfo("Slab:"), ml0 = meminfo("Mlocked:"), vma0 = slab("vm_area_struct"), mt0 = slab("maple_node");
  struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
  int pinned = 0;
  for (int i = 0; i < n; i++) {
    char p[512]; snprintf(p, sizeof p, "%s/d%d/f%d", argv[1], i / 1000, i);
    int fd = open(p, O_RDONLY); if (fd < 0) { perror(p); return 1; }
    void *m = mmap(0, sz, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) { printf("mmap failed at %d: %m\n", i); break; }
    if (mlock(m, sz)) { printf("mlock failed at %d: %m\n", i); break; }
    pinned++;
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
  printf("pinned %d in %.2f s; PageTables +%ld KiB, Slab +%ld KiB, Mlocked +%ld KiB, vm_area_struct +%ld KiB, maple_node +%ld KiB\n", pinned, s,
    meminfo("PageTables:")-pt0, meminfo("Slab:")-sl0, meminfo("Mlocked:")-ml0, (slab("vm_area_struct")-vma0)/1024, (slab("maple_node")-mt0)/1024);
  if (argc > 4) pause();
  return 0;
}
