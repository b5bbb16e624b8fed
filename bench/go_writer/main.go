// Command go_writer is the benchmark's compiled reference allocator: a process
// of its own, like the operator, that watches the claims of one namespace and
// writes each claim's precomputed allocation the operator's way (a JSON merge
// patch of the status carrying the resourceVersion it saw), with no placement
// work. It is what bench/operator_allocation.py compares the burst with when it
// asks how close an allocator can come to the burst bound when its own client
// costs almost nothing: client-go's JSON decoding, HTTP/2 and goroutines cost a
// fraction of what a Python client spends per request.
//
// Claim cNNNN with NNNN < -allocatable gets GPU NNNN % -gpus of node
// bench-node-(NNNN / -gpus), the same allocation as the Python reference. It
// prints "ready" once its watch is open, then one JSON line of figures when
// every allocatable claim has been written, and exits when its stdin closes;
// any failed write ends it at once with exit status 1 and the error.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

type figures struct {
	Written  int  `json:"written"`
	Protobuf bool `json:"protobuf"`
}

func allocation(i, gpus int) map[string]any {
	node := fmt.Sprintf("bench-node-%03d", i/gpus)
	return map[string]any{
		"devices": map[string]any{"results": []map[string]any{{
			"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": fmt.Sprintf("gpu-%d", i%gpus),
		}}},
		"nodeSelector": map[string]any{"nodeSelectorTerms": []map[string]any{{
			"matchFields": []map[string]any{{"key": "metadata.name", "operator": "In", "values": []string{node}}},
		}}},
		"allocationTimestamp": time.Now().UTC().Format("2006-01-02T15:04:05Z"),
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "go_writer: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the identity to write with")
	namespace := flag.String("namespace", "", "namespace whose claims to allocate")
	allocatable := flag.Int("allocatable", 800, "claims c0000.. below this index get an allocation")
	gpus := flag.Int("gpus", 8, "GPUs per node")
	writes := flag.Int("writes", 8, "writes in flight at most")
	protobuf := flag.Bool("protobuf", false, "talk protobuf to the API server instead of JSON")
	flag.Parse()
	if *kubeconfig == "" || *namespace == "" || *writes < 1 {
		fail("-kubeconfig and -namespace are required, -writes at least 1")
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	config.QPS = -1 // no client-side rate limit: the Python clients have none either
	if *protobuf {
		config.ContentType = runtime.ContentTypeProtobuf
		config.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	}
	clients, err := kubernetes.NewForConfig(config)
	if err != nil {
		fail("client: %v", err)
	}
	claims := clients.ResourceV1().ResourceClaims(*namespace)
	ctx := context.Background()
	listing, err := claims.List(ctx, metav1.ListOptions{})
	if err != nil {
		fail("list: %v", err)
	}
	w, err := claims.Watch(ctx, metav1.ListOptions{ResourceVersion: listing.ResourceVersion, AllowWatchBookmarks: true})
	if err != nil {
		fail("watch: %v", err)
	}
	defer w.Stop()
	fmt.Println("ready")

	type job struct {
		index           int
		name, resources string
	}
	jobs := make(chan job, *allocatable)
	var written atomic.Int64
	var workers sync.WaitGroup
	for range *writes {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for j := range jobs {
				body, _ := json.Marshal(map[string]any{
					"metadata": map[string]any{"resourceVersion": j.resources},
					"status":   map[string]any{"allocation": allocation(j.index, *gpus)},
				})
				_, err := claims.Patch(ctx, j.name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
				if err != nil {
					fail("claim %s: %v", j.name, err)
				}
				written.Add(1)
			}
		}()
	}

	events, queued := 0, 0
	for queued < *allocatable {
		event, ok := <-w.ResultChan()
		if !ok {
			fail("the watch ended after %d events, %d claims queued", events, queued)
		}
		if event.Type == watch.Error {
			fail("watch error: %v", event.Object)
		}
		claim, isClaim := event.Object.(*resourceapi.ResourceClaim)
		if !isClaim || event.Type != watch.Added {
			continue
		}
		events++
		index, err := strconv.Atoi(strings.TrimPrefix(claim.Name, "c"))
		if err != nil || index >= *allocatable || claim.Status.Allocation != nil {
			continue
		}
		jobs <- job{index: index, name: claim.Name, resources: claim.ResourceVersion}
		queued++
	}
	close(jobs)
	workers.Wait() // a failed write has ended the process already
	out, _ := json.Marshal(figures{Written: int(written.Load()), Protobuf: *protobuf})
	fmt.Println(string(out))
	// Stay until the benchmark closes stdin: it reads this process's CPU time after the window.
	_, _ = io.Copy(io.Discard, os.Stdin)
}
