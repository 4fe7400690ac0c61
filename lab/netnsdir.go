package lab

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

var (
	netnsDirOnce sync.Once
	netnsDirErr  error
)

// prepareNetnsDir makes NetnsDir a shared mount point before the first
// namespace is bound into it, as `ip netns add` does on first use. If it is
// a plain directory when our namespaces are bound, a later `ip netns add`
// (any process on the host) bind-mounts the directory over itself and our
// namespace files end up under that mount: they can then be neither
// unmounted (EINVAL) nor removed (EBUSY) until reboot.
func prepareNetnsDir() error {
	netnsDirOnce.Do(func() {
		if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
			netnsDirErr = err
			return
		}
		err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if errors.Is(err, unix.EINVAL) { // not a mount point yet
			if err = unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
				err = unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
			}
		}
		if err != nil {
			netnsDirErr = fmt.Errorf("make %s a shared mount point: %w", NetnsDir, err)
		}
	})
	return netnsDirErr
}
