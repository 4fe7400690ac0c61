package main

import (
	"context"
	"flag"
	"log/slog"
	"os/signal"
	"syscall"

	"github.com/xvs-lb/xvs/agent"
)

// runAgent is `xvs agent`: kube-proxy's command line (and --config file)
// into agent.Options, then the agent until SIGINT or SIGTERM.
func runAgent(args []string) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	o := &agent.Options{}
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := o.Complete(fs); err != nil {
		return err
	}
	v := int(o.Config.Logging.Verbosity)
	log := agent.NewLogger(o.Config.Logging.Format, v)
	slog.SetDefault(log)
	agent.RouteKlog(log, v)
	if o.Cleanup {
		return agent.Cleanup(log, o)
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
