// pause: the sandbox process of every pod on the test cluster's real node (the image the kubelet's
// --pod-infra-container-image names). It does what Kubernetes' own pause does
// (kubernetes/build/pause/linux/pause.c at v1.37.2): exit on SIGINT or SIGTERM, reap the zombies that
// end up as its children (it is PID 1 of the pod's PID namespace when that is shared), otherwise sleep.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for received := range signals {
		if received != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
