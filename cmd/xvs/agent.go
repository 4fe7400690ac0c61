package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/xvs-lb/xvs/agent"
	"github.com/xvs-lb/xvs/config"
	"github.com/xvs-lb/xvs/version"
)

// loggedError is an error main does not print: it is in the log already.
type loggedError struct{ error }

func (e loggedError) Unwrap() error { return e.error }

// runAgent is `xvs agent`: kube-proxy's command line (and --config file)
// into agent.Options, then the agent until SIGINT or SIGTERM.
func runAgent(args []string) (err error) {
	fs := pflag.NewFlagSet("xvs agent", pflag.ContinueOnError)
	fs.SortFlags = false
	o := &agent.Options{}
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil // usage printed; exit 0 as kube-proxy --help
		}
		return err
	}
	switch o.Version {
	case "true":
		fmt.Println(version.String())
		return nil
	case "raw":
		fmt.Println(version.Version())
		return nil
	}
	if err := o.Complete(fs); err != nil {
		return err
	}
	log, err := agent.NewLogger(&o.Config.Logging)
	if err != nil {
		return err
	}
	defer klog.Flush()
	slog.SetDefault(log)
	// Once the logging configuration applies, the reason the agent exits
	// is a line of its log, in its format, as kube-proxy's is
	// (component-base's cli.Run: "command failed"): main's plain
	// "xvs agent: ..." would be the one line of a JSON stream that is not
	// JSON.
	defer func() {
		if err != nil {
			log.Error("command failed", "err", err)
			err = loggedError{err}
		}
	}()
	if len(o.Ignored) > 0 {
		log.Warn("Flags ignored: the --config file sets these fields (as kube-proxy, which ignores them without a word)", "flags", o.Ignored)
	}
	switch {
	case o.WriteConfigTo != "":
		if err := config.Write(o.WriteConfigTo, &o.Config); err != nil {
			return err
		}
		log.Info("Wrote configuration", "file", o.WriteConfigTo)
		return nil
	case o.Cleanup:
		return agent.Cleanup(log, o)
	case o.InitOnly:
		return agent.InitOnly(log, o)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	a, err := agent.New(ctx, log, o)
	if err != nil {
		return err
	}
	defer a.Close()
	return a.Run(ctx)
}
