#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
static const char *base; static int N;
static void *run(void *arg) {
  long t = (long)arg; char d[512], p[600]; char buf[4096]; memset(buf, 7, sizeof buf);
  snprintf(d, sizeof d, "%s/t%ld", base, t); mkdir(d, 0755);
  for (int i = 0; i < N; i++) {
    snprintf(p, sizeof p, "%s/f%d", d, i);
    int fd = open(p, O_CREAT|O_WRONLY|O_TRUNC, 0644); if (fd < 0) { perror("open"); exit(1); }
    if (write(fd, buf, sizeof buf) != sizeof buf) { perror("write"); exit(1); }
    close(fd);
    struct stat st; stat(p, &st);
  }
  for (int i = 0; i < N; i++) { snprintf(p, sizeof p, "%s/f%d", d, i); unlink(p); }
  return 0;
}
int main(int argc, char **argv) {
  base = argv[1]; int T = atoi(argv[2]); N = atoi(argv[3]);
  pthread_t th[64]; struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
  for (long t = 0; t < T; t++) pthread_create(&th[t], 0, run, (void*)t);
  for (int t = 0; t < T; t++) pthread_join(th[t], 0);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
  struct rusage ru; getrusage(RUSAGE_SELF, &ru);
  double cpu = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  printf("%.0f files/s %.1f us-cpu/file\n", T * N / s, cpu * 1e6 / (T * N));
}
