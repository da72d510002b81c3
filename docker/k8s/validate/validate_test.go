package validate

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// manifestDir is docker/k8s, or $K8S_MANIFEST_DIR (the Python suite points it at broken
// copies to show that a failure here fails it).
func manifestDir() string {
	if dir := os.Getenv("K8S_MANIFEST_DIR"); dir != "" {
		return dir
	}
	return ".."
}

func TestManifestsDecodeStrictly(t *testing.T) {
	set, err := LoadDir(manifestDir())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ConfigMap", "Deployment", "PodDisruptionBudget", "Secret", "Service"}
	if got := set.Kinds(); !reflect.DeepEqual(got, want) {
		t.Fatalf("kinds %v, want %v", got, want)
	}
	d := set.Deployments[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas: want 2 (one leader, one standby)")
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe must GET /healthz")
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe must GET /readyz")
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources: want a CPU request and a memory limit")
	}
	if sc := d.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("pods must run as non-root")
	}
}

func TestBrokenManifestsAreRejected(t *testing.T) {
	for dir, want := range map[string]string{
		"testdata/unknown-field": `json: unknown field "livenesProbe"`,
		"testdata/wrong-type":    "cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32",
	} {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			_, err := LoadDir(dir)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("got error %v, want one containing %q", err, want)
			}
		})
	}
}

// Each case breaks one thing in a copy of the real manifests.
func TestBrokenCopiesAreRejected(t *testing.T) {
	cases := []struct{ name, file, old, new, want string }{
		{"bad quantity", "deployment.yaml", "memory: 512Mi", "memory: 512 apples", "quantities must match"},
		{"duplicate key", "deployment.yaml", "  replicas: 2\n", "  replicas: 2\n  replicas: 3\n", `key "replicas" already set`},
		{"missing secret key", "deployment.yaml", "key: dsn", "key: password", "uses missing secret key cdc-outbox/password"},
		{"missing configmap", "deployment.yaml", "name: cdc-outbox\n        - name: tmp", "name: other\n        - name: tmp", "uses missing ConfigMap other"},
		{"probe port", "deployment.yaml", "port: metrics\n            initialDelaySeconds", "port: http\n            initialDelaySeconds", "probe port http is not a named port"},
		{"pdb selector", "pdb.yaml", "component: relay", "component: writer", "PodDisruptionBudget cdc-outbox: selector matches no pod"},
		{"service selector", "service.yaml", "component: relay", "component: writer", "Service cdc-outbox-metrics: selector matches no pod"},
		{"unknown kind", "service.yaml", "kind: Service", "kind: Servic", `unsupported apiVersion/kind "v1/Servic"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			files, _ := filepath.Glob(filepath.Join(manifestDir(), "*.yaml"))
			for _, file := range files {
				data, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				text := string(data)
				if filepath.Base(file) == tc.file {
					if !strings.Contains(text, tc.old) {
						t.Fatalf("%s has no %q", tc.file, tc.old)
					}
					text = strings.Replace(text, tc.old, tc.new, 1)
				}
				if err := os.WriteFile(filepath.Join(dir, filepath.Base(file)), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err := LoadDir(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
